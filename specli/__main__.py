from specli.commands.app import main

main()
