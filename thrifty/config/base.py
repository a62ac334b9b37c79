"""What every part of the config shares: the user-error type, store URIs, and the frozen model base."""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, WithJsonSchema


class ConfigError(ValueError):
    """A user-fixable problem with the run's configuration (CLI exit code 2)."""


# The word 'auto' as one choice of a number-or-auto field. A bare Literal["auto"] is a JSON-schema `const`, which
# the Prefect UI shows as "is a const and cannot be changed"; an enum of one reads as a choice in its form.
AutoChoice = Annotated[Literal["auto"], WithJsonSchema({"type": "string", "enum": ["auto"], "title": "auto"})]


STORE_SCHEMES = ("file", "s3", "gs", "az")


def store_scheme(uri: str) -> str:
    """The scheme of a store URI (a plain path is file); ValueError naming the fix for anything no Store speaks."""
    if not uri.strip():
        raise ValueError("store is empty; give a path (e.g. .thrifty/store), file://, s3://, gs:// or az://")
    if "://" not in uri:
        m = re.match(r"^([A-Za-z][A-Za-z0-9+.-]*):/?(?!/)", uri)
        if m and len(m.group(1)) > 1:  # 's3:/bucket/x' or 'gs:bucket': a URI with a slash missing, not a path
            raise ValueError(f"store {uri!r} looks like a URI with a '//' missing; write it as "
                             f"{m.group(1)}://{uri[m.end():].lstrip('/')}")
        return "file"
    scheme, _, rest = uri.partition("://")
    if scheme not in STORE_SCHEMES:
        raise ValueError(f"unsupported scheme {scheme!r} in store {uri!r}; use a path, file://, s3://, gs:// or az://")
    if scheme != "file" and not rest.split("/", 1)[0]:
        what = "container" if scheme == "az" else "bucket"
        raise ValueError(f"store {uri!r} names no {what}; write it as {scheme}://{what}/prefix")
    if scheme == "file" and not rest.strip("/"):
        raise ValueError(f"store {uri!r} names no directory; write it as file:///path/to/store or a plain path")
    return scheme


def _check_store(uri: str) -> str:
    store_scheme(uri)
    return uri


StoreUri = Annotated[str, AfterValidator(_check_store)]  # a store every backend can open: checked where it is read


class _Frozen(BaseModel):
    # no inf or nan anywhere: they pass every bound (inf > 0) and turn into training that diverges, a budget
    # that is never reached, or null on a node (JSON has no inf)
    model_config = ConfigDict(frozen=True, extra="forbid", validate_default=True, allow_inf_nan=False)
