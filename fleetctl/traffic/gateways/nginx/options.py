"""What a person sets on an nginx gateway (Gateway.options), typed and checked by the
registry."""

from __future__ import annotations

import re
from dataclasses import dataclass

from fleetctl.traffic.gateways.schema import (
    access_log_option,
    connect_timeout_option,
    option,
    reload_timeout_option,
    shadow_collector_option,
    stream_timeout_option,
)

_LISTEN = re.compile(r"^(\d+\.\d+\.\d+\.\d+|\[[0-9a-fA-F:]+\]|localhost):\d+$")


def _listen(value: str) -> str | None:
    return None if _LISTEN.match(value) else f"must be HOST:PORT, not {value!r}"


@dataclass(frozen=True)
class NginxOptions:
    listen: str = option(check=_listen, help="the address nginx listens on, HOST:PORT "
                                             "(e.g. 127.0.0.1:8080)")
    nginx_bin: str = option("/usr/sbin/nginx", help="the nginx binary, for nginx -t")
    worker_processes: int = option(2, minimum=1, maximum=256, help="nginx worker processes")
    user: str | None = option(None, help="the user directive (\"\" for none); default: "
                                         "nobody nogroup when fleetctl runs as root, else none")
    model_source: str = option("body", choices=("body", "header"),
                               help="where the model is read: the JSON body, or the model "
                                    "header set by something in front")
    max_body_bytes: int = option(1024 * 1024, minimum=1024, maximum=256 * 1024 * 1024,
                                 help="larger request bodies are refused (413): the body is "
                                      "read whole to find the model")
    client_keepalive_s: int = option(0, minimum=0, maximum=3600,
                                     help="client keep-alive seconds (0: off, so a reload "
                                          "never closes an idle connection under a client)")
    connect_timeout_s: float = connect_timeout_option()
    stream_timeout_s: int = stream_timeout_option()
    http_timeout_s: float = option(2.0, minimum=0.01, maximum=600,
                                   help="seconds per call to nginx's version page")
    reload_timeout_s: float = reload_timeout_option()
    shadow_collector: str | None = shadow_collector_option()
    access_log: str | None = access_log_option()
