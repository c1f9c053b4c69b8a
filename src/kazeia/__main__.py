from kazeia.cli.main import main

raise SystemExit(main())
