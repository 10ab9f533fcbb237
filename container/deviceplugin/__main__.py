from container.deviceplugin.main import main

raise SystemExit(main())
