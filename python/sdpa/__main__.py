from .info import main

main()
