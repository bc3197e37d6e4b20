"""The one registry shape (pytest_storagescale/registry.py): each rule once on the
generic class, and what a session's hooks add scoped to that session."""

from __future__ import annotations

import re
import sys

import pytest

from pytest_storagescale.errors import StorageScaleUsageError
from pytest_storagescale.registry import RegistrationError, Registry, open_scope

SITE_CONFTEST = '''
from pytest_storagescale.drivers.memory import MemoryDriver
from pytest_storagescale.load.operations import Operation


class {op_class}(Operation):
    name = "touch"

    def run(self, driver, client, iteration, context):
        return 0


class SiteStore(MemoryDriver):
    name = "sitestore"
    schemes = ("sitestore",)


def pytest_storagescale_operations():
    return [{op_class}()]


def pytest_storagescale_drivers():
    return [SiteStore]


def pytest_storagescale_metrics():
    return {{"touch_share": "{description}"}}
'''

SEES = '''
from pytest_storagescale.drivers.registry import driver_names, known_schemes
from pytest_storagescale.load.operations import operation_names
from pytest_storagescale.metrics import known_metrics


def test_sees():
    assert ("touch" in operation_names(), "sitestore" in driver_names(),
            "sitestore" in known_schemes(), "touch_share" in known_metrics()) == {expected}
'''


def test_what_a_sessions_hooks_add_is_gone_in_the_next_session_of_the_process(pytester):
    """pytester runs sessions in this process, as a site's own tooling may: the
    operation, driver and metric a session's conftest gave were process-global, so the
    next session saw them, and refused another class under the same name."""
    from pytest_storagescale.drivers.registry import driver_names
    from pytest_storagescale.load.operations import operation_names
    from pytest_storagescale.metrics import known_metrics

    first = pytester.mkdir("first")
    (first / "conftest.py").write_text(SITE_CONFTEST.format(op_class="Touch",
                                                            description="touches per stat"))
    (first / "test_a.py").write_text(SEES.format(expected=(True, True, True, True)))
    pytester.inline_run(str(first), "-p", "no:cacheprovider").assertoutcome(passed=1)
    assert "touch" not in operation_names() and "sitestore" not in driver_names()
    assert "touch_share" not in known_metrics()

    second = pytester.mkdir("second")
    (second / "test_b.py").write_text(SEES.format(expected=(False, False, False, False)))
    pytester.inline_run(str(second), "-p", "no:cacheprovider").assertoutcome(passed=1)

    # another class and description under the same names: its own, not a conflict
    third = pytester.mkdir("third")
    (third / "conftest.py").write_text(SITE_CONFTEST.format(op_class="Tap",
                                                            description="taps per stat"))
    (third / "test_c.py").write_text(SEES.format(expected=(True, True, True, True)))
    pytester.inline_run(str(third), "-p", "no:cacheprovider").assertoutcome(passed=1)


# -- each rule once, on the generic class ---------------------------------------------


class Widget:
    name = "widget"


def widgets(**options) -> Registry:
    return Registry("widget", adder="register_widget", name_hint="Use letters.",
                    pattern=r"[a-z]+", **options)


def test_a_name_must_match_the_pattern():
    registry = widgets()
    bad = type("Bad", (Widget,), {"name": "Bad name"})
    with pytest.raises(RegistrationError,
                       match=r"register_widget: Bad.name 'Bad name' is not a widget name\. "
                             r"Use letters\."):
        registry.add(bad)
    with pytest.raises(RegistrationError, match=r"'x1' is not a widget name"):
        registry.add_lazy("x1", "somewhere:Widget")
    assert registry.names() == ()
    assert issubclass(RegistrationError, ValueError)  # register_driver's error before
    assert issubclass(RegistrationError, StorageScaleUsageError)  # one paragraph, exit 4


def test_a_lazy_built_in_is_imported_when_first_asked_for(tmp_path, monkeypatch):
    module = "lazy_widget_" + re.sub(r"\W", "_", tmp_path.name)
    (tmp_path / f"{module}.py").write_text("class Widget:\n    name = 'widget'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    registry = widgets()
    registry.add_lazy("widget", f"{module}:Widget")
    registry.add_lazy("gone", "no_such_module_xyz:Widget", install_hint="'pip install gone'")
    assert registry.names() == ("widget", "gone") and module not in sys.modules
    assert not registry.is_loaded("widget")
    assert registry.get("widget") is sys.modules[module].Widget
    assert registry.is_loaded("widget")
    with pytest.raises(StorageScaleUsageError,
                       match=r"^the gone widget needs 'pip install gone'\. Import of "
                             r"no_such_module_xyz:Widget failed: No module named"):
        registry.get("gone")
    with pytest.raises(StorageScaleUsageError,
                       match=r"^unknown widget 'nope'\. Known widgets: widget, gone\.$"):
        registry.get("nope")
    with pytest.raises(RegistrationError, match=r"'module:attribute', got 'nodots'"):
        registry.add_lazy("other", "nodots")


def _installed(tmp_path, monkeypatch, group: str, points: str) -> str:
    """A distribution on sys.path declaring ``points`` in ``group``; its module's name."""
    module = "ep_widget_" + re.sub(r"\W", "_", tmp_path.name)
    (tmp_path / f"{module}.py").write_text(
        "class Widget:\n    name = 'widget'\n\nclass Gadget:\n    name = 'gadget'\n")
    info = tmp_path / "widgets-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: widgets\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[{group}]\n{points.replace('M:', module + ':')}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    return module


def test_entry_points_are_read_once_and_imported_when_used(tmp_path, monkeypatch):
    group = "pytest_storagescale.test_widgets"
    module = _installed(tmp_path, monkeypatch, group, "widget = M:Widget\ntap = M:Gadget")
    registry = widgets(entry_points=group)
    assert registry.names() == ("widget", "tap") and module not in sys.modules
    assert registry.get("widget").__name__ == "Widget"
    with pytest.raises(StorageScaleUsageError,
                       match=r"entry point tap = '\w+:Gadget' \(group "
                             r"pytest_storagescale.test_widgets, package widgets\): names "
                             r"'gadget'; name the entry point after the widget it gives"):
        registry.get("tap")


def test_an_entry_point_under_a_taken_name_fails_every_lookup(tmp_path, monkeypatch):
    group = "pytest_storagescale.test_widgets_taken"
    _installed(tmp_path, monkeypatch, group, "widget = M:Widget")
    registry = widgets(entry_points=group)
    registry.add(Widget)
    for _ in range(2):  # not read as done: said again until the package is fixed
        with pytest.raises(StorageScaleUsageError,
                           match=r"entry point widget = .*widget 'widget' is already "
                                 r"registered \(test_registry.Widget\)"):
            registry.names()


def test_an_eager_registry_fails_every_lookup_on_a_broken_package(tmp_path, monkeypatch):
    group = "pytest_storagescale.test_widgets_eager"
    _installed(tmp_path, monkeypatch, group, "widget = M:Missing")
    registry = widgets(entry_points=group, eager_entry_points=True)
    for _ in range(2):
        with pytest.raises(StorageScaleUsageError,
                           match=r"cannot load: AttributeError: .*Fix or uninstall that package"):
            registry.names()


def test_the_same_class_again_takes_its_place_another_needs_replace():
    registry = widgets()
    registry.add(Widget)
    # a module imported again (a conftest of a second session): a new class object
    again = type("Widget", (), {"name": "widget", "__module__": Widget.__module__,
                                "__qualname__": "Widget"})
    registry.add(again)
    assert registry.get("widget") is again and registry.names() == ("widget",)
    other = type("Other", (), {"name": "widget"})
    with pytest.raises(RegistrationError,
                       match=r"register_widget: widget 'widget' is already registered "
                             r"\(test_registry.Widget\)\. Choose another name, or pass "
                             r"replace=True\."):
        registry.add(other)
    registry.add(other, replace=True)
    assert registry.get("widget") is other
    # what makes two items the same is the registry's (a metric: its description)
    texts = Registry("note", adder="add_note", name_attr=None, identity=repr)
    texts.add("one line", name="n")
    texts.add("one line", name="n")
    with pytest.raises(RegistrationError, match=r"note 'n' is already registered \('one line'\)"):
        texts.add("another line", name="n")


def test_what_a_scope_adds_leaves_with_it():
    registry = widgets()
    registry.add(Widget)
    gadget = type("Gadget", (), {"name": "gadget"})
    with open_scope("outer") as outer:
        registry.add(gadget, scope=outer)
        assert registry.names() == ("widget", "gadget") and "gadget" in registry
        inner = open_scope("inner")  # a session inside a session: sees its own only
        assert registry.names() == ("widget",)
        other = type("Other", (), {"name": "gadget"})
        registry.add(other, scope=inner)  # not a conflict with the outer session's
        assert registry.get("gadget") is other
        inner.close()
        assert registry.get("gadget") is gadget
        abandoned = open_scope("a session that ended unconfigured")
        registry.add(other, scope=abandoned)
    assert registry.names() == ("widget",)  # closing a scope closes those opened in it
    assert not abandoned.open
    with pytest.raises(RegistrationError, match=r"is closed"):
        registry.add(gadget, scope=outer)
