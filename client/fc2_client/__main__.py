"""`python -m fc2_client …`: the same as `fc2 …`."""

from fc2_client.cli import main

raise SystemExit(main())
