"""What every part of the config shares: the user-error type, store URIs, and the frozen model base."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, WithJsonSchema, model_validator


class ConfigError(ValueError):
    """A user-fixable problem with the run's configuration (CLI exit code 2)."""


MAX_ECHO_CHARS = 120  # a value quoted in an error message is cut to this many characters


def shown(value: Any, limit: int = MAX_ECHO_CHARS) -> str:
    """``repr(value)`` cut to about ``limit`` characters, saying how long it was: a 50 MB value makes a short error."""
    if isinstance(value, (str, bytes)) and len(value) > limit:
        return f"{value[:limit]!r}... ({len(value):,} characters)"
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text):,} characters)"


def cut(text: str, limit: int = MAX_ECHO_CHARS) -> str:
    """Plain text cut to ``limit`` characters, saying how long it was."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text):,} characters)"


# The word 'auto' as one choice of a number-or-auto field. A bare Literal["auto"] is a JSON-schema `const`, which
# the Prefect UI shows as "is a const and cannot be changed"; an enum of one reads as a choice in its form.
AutoChoice = Annotated[Literal["auto"], WithJsonSchema({"type": "string", "enum": ["auto"], "title": "auto"})]


STORE_SCHEMES = ("file", "s3", "gs", "az")


# what each provider accepts as a bucket (container) name; a name outside it fails in the SDK (a traceback) or makes a
# request that never returns (a space in a GCS bucket). S3 keeps the SDK's wider set: buckets made before 2018 may hold
# capitals and '_'.
BUCKET_NAMES = {
    "s3": (re.compile(r"[A-Za-z0-9._-]{1,255}"), "S3 bucket names are 3-63 lowercase letters, digits, '.' and '-'"),
    "gs": (re.compile(r"[a-z0-9._-]{1,222}"), "GCS bucket names are 3-63 lowercase letters, digits, '-', '_' and '.'"),
    "az": (re.compile(r"\$?[a-z0-9-]{1,63}"), "Azure container names are 3-63 lowercase letters, digits and '-'"),
}
MAX_PATH_PART_BYTES = 255  # a file name on every common file system
MAX_STORE_CHARS = 1024  # an object key's limit on S3 and GCS; a store's prefix leaves room for the keys under it


def store_scheme(uri: str) -> str:
    """The scheme of a store URI (a plain path is file); ValueError naming the fix for anything no Store speaks."""
    if not uri.strip():
        raise ValueError("store is empty; give a path (e.g. .thrifty/store), file://, s3://, gs:// or az://")
    if len(uri) > MAX_STORE_CHARS:
        raise ValueError(f"store {shown(uri)} is too long (at most {MAX_STORE_CHARS} characters); pick a shorter one")
    if any(ord(c) < 32 or ord(c) == 127 for c in uri):
        raise ValueError(f"store {shown(uri)} holds a control character (a newline, a tab, a NUL); remove it")
    if "://" not in uri:
        m = re.match(r"^([A-Za-z][A-Za-z0-9+.-]*):/?(?!/)", uri)
        if m and len(m.group(1)) > 1:  # 's3:/bucket/x' or 'gs:bucket': a URI with a slash missing, not a path
            raise ValueError(f"store {uri!r} looks like a URI with a '//' missing; write it as "
                             f"{m.group(1)}://{uri[m.end():].lstrip('/')}")
        _check_path(uri, uri)
        return "file"
    scheme, _, rest = uri.partition("://")
    if scheme not in STORE_SCHEMES:
        raise ValueError(f"unsupported scheme {shown(scheme)} in store {shown(uri)}; use a path, file://, s3://, gs:// "
                         "or az://")
    bucket, _, prefix = rest.partition("/")
    if scheme != "file" and not bucket:
        what = "container" if scheme == "az" else "bucket"
        raise ValueError(f"store {uri!r} names no {what}; write it as {scheme}://{what}/prefix")
    if scheme == "file" and not rest.strip("/"):
        raise ValueError(f"store {uri!r} names no directory; write it as file:///path/to/store or a plain path")
    if scheme == "file":
        _check_path(uri, rest)
    else:
        pattern, rule = BUCKET_NAMES[scheme]
        if not pattern.fullmatch(bucket):
            raise ValueError(f"store {shown(uri)}: {shown(bucket)} is not a valid name ({rule}); fix the name")
        if any(part in (".", "..") for part in prefix.split("/")):
            raise ValueError(f"store {shown(uri)}: its prefix may not hold '.' or '..' as a part; write the prefix "
                             "without them")
    return scheme


def _check_path(uri: str, path: str) -> None:
    for part in path.split("/"):
        if len(part.encode("utf-8", "surrogateescape")) > MAX_PATH_PART_BYTES:
            raise ValueError(f"store {shown(uri)}: the path part {shown(part, 40)} is longer than a file name may be "
                             f"({MAX_PATH_PART_BYTES} bytes); shorten it")


def _check_store(uri: str) -> str:
    store_scheme(uri)
    return uri


StoreUri = Annotated[str, AfterValidator(_check_store)]  # a store every backend can open: checked where it is read


MAX_FLOAT = 1e9  # seconds (31 years), dollars, rates: past it a number is a typo, and torch (float32) or a timer overflows
MAX_INT = 2**53  # steps, counts: the largest integer JSON (and so the Prefect UI) keeps exact


class _Frozen(BaseModel):
    # no inf or nan anywhere: they pass every bound (inf > 0) and turn into training that diverges, a budget
    # that is never reached, or null on a node (JSON has no inf)
    model_config = ConfigDict(frozen=True, extra="forbid", validate_default=True, allow_inf_nan=False)

    @model_validator(mode="after")
    def _numbers_in_range(self) -> "_Frozen":
        """No setting is a number past MAX_FLOAT / MAX_INT: 1e300 passes 'greater than 0' and then overflows."""
        for name in type(self).model_fields:
            value = getattr(self, name)
            for v in value if isinstance(value, (list, tuple)) else (value,):
                if isinstance(v, bool) or not isinstance(v, (int, float)):
                    continue
                limit = MAX_INT if isinstance(v, int) else MAX_FLOAT
                if abs(v) > limit:
                    what = f"{v:.3g}" if isinstance(v, float) else f"an integer of {v.bit_length()} bits"
                    raise ValueError(f"{name} = {what} is out of range (at most {limit:.3g} in size); "
                                     f"set {name} to a realistic value")
        return self
