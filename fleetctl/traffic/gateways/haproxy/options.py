"""What a person sets on an HAProxy gateway (Gateway.options), typed and checked by the
registry. Paths are on the HAProxy host, which must be the host fleetctl's push worker runs
on: the adapter writes the config file and runs `haproxy -c`."""

from __future__ import annotations

from dataclasses import dataclass

from fleetctl.traffic.gateways.schema import (
    absolute_path,
    access_log_option,
    connect_timeout_option,
    option,
    reload_timeout_option,
    stream_timeout_option,
)


@dataclass(frozen=True)
class HAProxyOptions:
    bind: str = option(help="where the frontend listens, e.g. 127.0.0.1:8080")
    config_path: str = option(check=absolute_path,
                              help="the haproxy.cfg fleetctl renders (HAProxy runs with -f on it)")
    master_socket: str = option(check=absolute_path,
                                help="the master CLI socket (HAProxy runs with -W -S on it); "
                                     "reloads go through it")
    state_file: str | None = option(None, check=absolute_path,
                                    help="the server-state file; default: server-state beside "
                                         "config_path")
    haproxy_bin: str = option("/usr/sbin/haproxy", help="the haproxy binary, for haproxy -c")
    health_checks: bool = option(True, help="check each server's /health every 2 s")
    max_body_bytes: int = option(256 * 1024, minimum=1024, maximum=64 * 1024 * 1024,
                                 help="larger request bodies are refused (413): the body is "
                                      "read whole to find the model")
    connect_timeout_s: float = connect_timeout_option()
    stream_timeout_s: int = stream_timeout_option()
    runtime_timeout_s: float = option(2.0, minimum=0.01, maximum=600,
                                      help="seconds per runtime API or master CLI command")
    reload_timeout_s: float = reload_timeout_option()
    # HAProxy logs to a stream, not a file: the config sends the log to stdout, and whatever
    # starts HAProxy appends that stream to this file (docs/gateways.md).
    access_log: str | None = access_log_option()
