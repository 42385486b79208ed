from specli.cli import main

main()
