"""Showing a database URL without its secrets: the one helper every message uses.

SQLAlchemy's ``render_as_string()`` masks only the ``user:password@`` part; a
password given as a query option (``?password=...``, libpq's
``sslpassword``, PyMySQL's ``passwd``, a token for a cloud proxy...) was
printed verbatim -- in exceptions, on the CLI's stderr and in Alembic's
``FAILED:`` line. :func:`shown_url` masks the password and the value of every
query option whose name looks secret (:func:`is_secret_key`, generous on
purpose: a path such as ``sslkey`` is masked too).

Drivers' own messages rarely echo a connection string, but nothing guarantees
it: every secret a shown URL carried is remembered for this process
(:func:`remember_secrets`) and :func:`scrub` replaces those values in a text
(execution.translate_error scrubs the driver text it words a message with).

Nothing here imports SQLAlchemy: a ``URL`` object is recognised by its attributes.
"""

from __future__ import annotations

import re
import threading
from typing import Any
from urllib.parse import quote, quote_plus, unquote_plus

MASK = "***"
# Parts of a query option's name that mark its value as secret.
SECRET_WORDS = (
    "pass",  # password, passwd, sslpassword, passphrase, passfile
    "pwd",
    "secret",
    "token",
    "key",  # sslkey, ssl_key, api_key, private_key
    "credential",
    "private",
    "signature",
)
# Shorter values are not scrubbed from free text: a two-letter password would
# blank every occurrence of two letters in a driver's message. They are still
# masked wherever a URL is shown.
MIN_SCRUBBED_LENGTH = 4

_known: set[str] = set()
_known_guard = threading.Lock()

# ``scheme://user:password@`` (the password is everything up to the last "@"
# before the host part).
_USERINFO_PASSWORD = re.compile(r"(?P<head>://[^/?#@:]*:)(?P<password>[^/?#]*)(?P<at>@)")
_QUERY_OPTION = re.compile(r"(?P<head>[?&;](?P<key>[^=&#;]+)=)(?P<value>[^&#;]*)")


def is_secret_key(name: str) -> bool:
    """Whether a URL query option called *name* may carry a secret."""
    lowered = unquote_plus(name).lower()
    return any(word in lowered for word in SECRET_WORDS)


def _is_url(value: object) -> bool:
    return hasattr(value, "render_as_string") and hasattr(value, "query")


def _mask_text(text: str) -> str:
    """Mask the password and the secret query values of a URL written as text."""
    text = _USERINFO_PASSWORD.sub(
        lambda m: f"{m['head']}{MASK}{m['at']}" if m["password"] else m[0], text, count=1
    )
    return _QUERY_OPTION.sub(
        lambda m: f"{m['head']}{MASK}" if is_secret_key(m["key"]) else m[0], text
    )


def secrets_of(url: Any) -> list[str]:
    """The secret values *url* (a SQLAlchemy ``URL`` or a URL string) carries."""
    found: list[str] = []
    if _is_url(url):
        if url.password:
            found.append(str(url.password))
        for key, value in url.query.items():
            if is_secret_key(key):
                found.extend([value] if isinstance(value, str) else list(value))
        return [value for value in found if value]
    text = str(url)
    password = _USERINFO_PASSWORD.search(text)
    if password and password["password"]:
        found.append(unquote_plus(password["password"]))
    for option in _QUERY_OPTION.finditer(text):
        if is_secret_key(option["key"]) and option["value"]:
            found.append(unquote_plus(option["value"]))
    return found


def remember_secrets(url: Any) -> None:
    """Remember *url*'s secrets, for :func:`scrub` to remove from messages later."""
    values = [value for value in secrets_of(url) if len(value) >= MIN_SCRUBBED_LENGTH]
    if values:
        with _known_guard:
            _known.update(values)


def shown_url(url: Any) -> str:
    """*url* (a SQLAlchemy ``URL`` or a URL string) as a message may show it: the
    password and every secret-looking query value are ``***``."""
    remember_secrets(url)
    if _is_url(url):
        return _mask_text(str(url.render_as_string(hide_password=True)))
    return _mask_text(str(url))


def scrub(text: str) -> str:
    """*text* with every remembered secret (and its URL-quoted form) replaced by ``***``."""
    with _known_guard:
        known = sorted(_known, key=len, reverse=True)
    for value in known:
        for form in {value, quote_plus(value), quote(value, safe="")}:
            if form in text:
                text = text.replace(form, MASK)
    return text
