# rtkit.commands -- one module per `rtkit` sub-command, each with register(subparsers) and main(args) -> int.
