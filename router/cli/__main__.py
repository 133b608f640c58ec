"""`python -m router.cli`: the same command line as the `tierroute` script."""

from router.cli.main import main

raise SystemExit(main())
