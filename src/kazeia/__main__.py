from kazeia.cli.main import entry

raise SystemExit(entry())
