from modak.cli import main

raise SystemExit(main())
