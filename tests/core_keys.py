"""The keys of the dicts that cross the binding: those a TypedDict of rsgl.core_types declares,
and those the engine lists when it refuses an unknown one."""

import re
import typing


def declared(typed_dict: type) -> set[str]:
    return set(typing.get_type_hints(typed_dict))


def known_keys(refusal: Exception) -> set[str]:
    """The keys serde lists when it refuses an unknown one."""
    match = re.search(r"expected (?:one of )?(`.*)$", str(refusal))
    assert match, f"not an unknown-key refusal: {refusal}"
    return set(re.findall(r"`(\w+)`", match.group(1)))
