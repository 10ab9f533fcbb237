from deviceplugin.main import main

raise SystemExit(main())
