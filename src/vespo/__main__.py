from vespo.cli import main

raise SystemExit(main())
