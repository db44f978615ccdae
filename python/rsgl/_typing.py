"""Type aliases shared by the package's modules."""

from typing import Any, TypeAlias

# A parsed JSON object whose keys are not fixed: config files, request bodies, API responses.
JsonObject: TypeAlias = dict[str, Any]
