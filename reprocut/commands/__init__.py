"""One module per subcommand: `add_arguments(parser)` and `run(options, console) -> ExitCode`."""
