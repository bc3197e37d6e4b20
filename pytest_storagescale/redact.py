"""The one place where credentials are taken out of text: URL user:password, token
query parameters (``authz=``, ``access_token=``...) and driver option values. Every
URL or command line the plugin prints or records goes through here."""

from __future__ import annotations

import re

#: ``scheme://user:password@`` (or ``user@``) in a URL
_USERINFO = re.compile(r"([A-Za-z][\w+.-]*://)[^/@\s]+@")
#: query parameters that carry a bearer token or an XRootD authorization
_SECRET_QUERY = re.compile(
    r"(?i)([?&](?:authz|access_token|bearer_token|token|xrd\.gsiusrpxy)=)[^&#\s]*")
_DRIVER_OPTION = "--storage-driver-option"


def redact_url(text: str) -> str:
    """``text`` without URL userinfo and with token query values as ``***``."""
    return _SECRET_QUERY.sub(r"\1***", _USERINFO.sub(r"\1", text))


def redact_option(item: str) -> str:
    """A driver option as ``key=***`` (the key only, when it is not key=value)."""
    key, sep, _ = item.partition("=")
    return f"{key}=***" if sep else "***"


def redact_argv(argv: list[str]) -> list[str]:
    """A command line with every driver option value and URL credential hidden."""
    shown, hide_next = [], False
    for arg in argv:
        if hide_next:
            shown.append(redact_option(arg))
            hide_next = False
        elif arg == _DRIVER_OPTION:
            shown.append(arg)
            hide_next = True
        elif arg.startswith(_DRIVER_OPTION + "="):
            shown.append(f"{_DRIVER_OPTION}={redact_option(arg.split('=', 1)[1])}")
        else:
            shown.append(redact_url(arg))
    return shown
