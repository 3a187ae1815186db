"""What runs around and after the first import of TensorFlow and of Keras in
a process, whoever imports them (the user, Keras importing TensorFlow as its
backend, TensorFlow importing Keras, keras-hub or tensorflow-text importing
either): `install` puts a finder at the head of `sys.meta_path` that finds
those modules (`WATCHED`) as the other finders do and wraps their loaders;
once an import is done the module names its own loader again. `import
txl_tf` imports none of them, and uses this to drop TensorFlow's start-up
noise (`tf_startup`) and to register its classes with Keras as soon as Keras
is there (`when_keras_is_imported`; while one of its own modules is
half-imported, not yet). Standard library only.
"""
import contextlib
import importlib.abc
import sys
import threading

# TensorFlow and Keras, and the packages the library's Keras modules import that import
# either while they load: a callback waits until its thread half-imports none of them.
WATCHED = ("tensorflow", "keras", "keras_hub", "tensorflow_text")
_around = {}  # module name -> the context manager factory its first import runs in
_waiting = []  # callbacks of `when_keras_is_imported` not yet called
# Per thread (a module half-imported by another thread is behind its import lock, not
# partial): .executing, the watched modules whose first import runs in it; .finding, the
# names its finder is finding.
_thread = threading.local()
_held = []  # packages whose modules' imports hold the callbacks back too (`when_keras_is_imported`)


def install(around=None):
    """Watches the first imports of `WATCHED` (one finder a process).

    Args:
        around: `{module name: factory}`: that module's first import runs in
            the context manager `factory()` returns.
    """
    _around.update(around or {})
    if not any(isinstance(finder, _FirstImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _FirstImport())


def when_keras_is_imported(callback, package=None):
    """Calls `callback()` once Keras is imported and, in the thread that
    calls it, no first import of a `WATCHED` module is still running (they
    import each other) nor any import of a module of `package` (`import
    package.module` whose import imports TensorFlow: a callback that imports
    the package's modules would find that one without its names): now where
    that is so, else when the last of those imports ends."""
    if package is not None and package not in _held:
        _held.append(package)
    _waiting.append(callback)
    _call_waiting()


def _in_thread(name):
    return _thread.__dict__.setdefault(name, set())


def _call_waiting():
    if _in_thread("executing") or "keras" not in sys.modules:
        return
    while _waiting:
        try:
            callback = _waiting.pop(0)
        except IndexError:  # another thread took the last
            return
        callback()


class _FirstImport(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name not in WATCHED and not name.startswith(tuple(f"{p}." for p in _held)):
            return None
        finding = _in_thread("finding")
        if name in finding:  # asked again by a finder it asked (one that asks the others too)
            return None
        finding.add(name)
        try:
            for finder in sys.meta_path:
                find = getattr(finder, "find_spec", None)
                spec = None if finder is self or find is None else find(name, path, target)
                if spec is not None:
                    break
            else:
                return None
        finally:
            finding.discard(name)
        if hasattr(spec.loader, "exec_module"):
            spec.loader = _WatchedLoader(spec.loader, name)
        return spec


class _WatchedLoader(importlib.abc.Loader):
    """A watched module's own loader, run in its `around` context."""

    def __init__(self, loader, name):
        self._loader, self._name = loader, name

    def __getattr__(self, name):  # resource readers and the like: the real loader's
        return getattr(self._loader, name)

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        _in_thread("executing").add(self._name)
        try:
            with _around.get(self._name, contextlib.nullcontext)():
                self._loader.exec_module(module)
        finally:
            _in_thread("executing").discard(self._name)
            module.__loader__ = module.__spec__.loader = self._loader
        _call_waiting()
