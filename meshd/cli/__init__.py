"""The ``meshd`` command line: one module per subcommand, each thin over a library."""
