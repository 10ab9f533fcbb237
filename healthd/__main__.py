from healthd.main import main

raise SystemExit(main())
