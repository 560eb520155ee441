"""CSV cells a spreadsheet will not run.

Excel, LibreOffice and Google Sheets read a cell that starts with = + - @ (or a tab or carriage
return before one) as a formula, so free text someone typed into fleetctl — a reason, a
message, an error a pool sent back — could run as one when an auditor opens an export. OWASP's
advice: prefix such a text cell with a single quote, which the spreadsheet shows as text.
Numbers are left alone (a negative number is data, not a formula).
"""

from __future__ import annotations

from typing import Any

FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def spreadsheet_safe(value: Any) -> Any:
    if isinstance(value, str) and value.startswith(FORMULA_STARTS):
        return "'" + value
    return value
