from specli.commands.cli import main

main()
