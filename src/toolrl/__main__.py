from toolrl.cli import main

main()
