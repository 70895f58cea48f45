#!/usr/bin/env python
"""Django's command-line entry point in a checkout (installed: ``switchyard manage``)."""

from config.manage import main

if __name__ == "__main__":
    main()
