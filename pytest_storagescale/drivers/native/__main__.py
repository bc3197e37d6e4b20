"""``python -m pytest_storagescale.drivers.native``: build the compiled client loop now
(``make setup`` does), rather than before the first step that uses it."""

from . import Unavailable, build

try:
    print(f"compiled client loop: {build()}")
except (Unavailable, OSError) as exc:  # make setup goes on: the bindings still work
    print(f"compiled client loop not built: {exc}")
