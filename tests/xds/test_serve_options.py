"""`manage.py xds_serve` refuses options it cannot run with before it listens."""

from __future__ import annotations

import pytest
from django.core.management import CommandError, call_command


@pytest.mark.parametrize(("args", "says"), [
    (["--poll-s", "0"], "--poll-s 0 is out of range: from 0.1 to 3600 seconds"),
    (["--poll-s", "7200"], "--poll-s 7200 is out of range"),
    (["--port", "70000"], "--port 70000 is not a port number"),
])
def test_xds_serve_refuses_an_option_out_of_range(args: list[str], says: str) -> None:
    with pytest.raises(CommandError, match=says):
        call_command("xds_serve", *args)
