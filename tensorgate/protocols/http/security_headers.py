"""Headers every HTTP answer carries (S-20): a body is never sniffed into something a browser
renders (an error echoing a request's text as HTML), whatever its content type says."""

from __future__ import annotations

NOSNIFF = (b"x-content-type-options", b"nosniff")
NOSNIFF_LINE = b"x-content-type-options: nosniff\r\n"
