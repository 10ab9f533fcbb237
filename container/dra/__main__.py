from container.dra.main import main

raise SystemExit(main())
