"""The terminal helpers both command lines share, for ``raylane.client.cli``:
they live in ``raylane.orchestrator.terminal`` (client dependencies
only), where the server's CLI imports them without importing the client."""

from raylane.orchestrator.terminal import (  # noqa: F401
    EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, EXIT_TIMEOUT, EXIT_UNREACHABLE, EXIT_USAGE, OUTPUT, Output, console, fail,
    print_json)
