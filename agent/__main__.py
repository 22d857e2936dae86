import sys

from numparity_agent._cli import main

sys.exit(main())
