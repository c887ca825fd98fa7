from meshd.cli.main import entry

entry()
