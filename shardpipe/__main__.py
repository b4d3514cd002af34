from shardpipe.cli import main

main()
