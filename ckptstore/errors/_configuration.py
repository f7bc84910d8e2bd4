"""Errors in how ckptstore is set up: plugins, names, epochs, jobs, environment
variables, storage options and task groups (``ValueError``, ``TypeError``...)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ckptstore._suggest import closest
from ckptstore.errors._base import CkptStoreError


class PluginError(CkptStoreError):
    """A plugin could not be found, loaded or registered.

    Example::

        >>> from ckptstore.plugin import get_registry
        >>> try:
        ...     get_registry().db_type("nosuchformat")
        ... except PluginError as err:
        ...     print(type(err).__name__)
        UnknownPluginError
    """


class UnknownPluginError(PluginError, KeyError):
    """No installed plugin provides the requested name; ``suggestion`` is the installed
    name closest to it, if one is alike (a typo), and the message asks "did you mean".

    Example::

        >>> from ckptstore.plugin import get_registry
        >>> get_registry().db_type("nosuchformat")
        Traceback (most recent call last):
        ckptstore.errors.UnknownPluginError: ...
        >>> try:
        ...     get_registry().db_type("nzp")
        ... except UnknownPluginError as error:
        ...     print(error.suggestion, "|", error)
        npz | unknown db type 'nzp' (did you mean 'npz'?); installed: ...
    """

    def __init__(self, kind: str, name: str, installed: Iterable[str], hint: str | None) -> None:
        self.kind = kind
        self.name = name
        self.installed = tuple(sorted(installed))
        listing = ", ".join(self.installed) or "none"
        close = closest(name, self.installed)
        self.suggestion = close
        guess = f" (did you mean {close!r}?)" if close else ""
        fix = hint or "install a plugin that provides it (see `ckptstore plugins`)"
        super().__init__(
            f"unknown {kind} {name!r}{guess}; installed: {listing}. To use {name!r}, {fix}."
        )


class BrokenPluginError(UnknownPluginError):
    """The requested name is, or may be, provided by an installed plugin that was left out
    because it failed to import, validate or answer a hook (``ckptstore plugins`` lists
    it with its error).

    ``broken`` lists each such plugin as ``(entry-point name, distribution, error)``;
    ``declared`` says whether they declared ``name`` (``False``: they failed before
    saying what they provide, so the name may be theirs or nobody's).

    Example::

        >>> broken = [("fast", "ckptstore-fast 0.1", "ImportError: no numba")]
        >>> err = BrokenPluginError("db type", "fast", ["npz"], broken, declared=True)
        >>> print(err)
        db type 'fast' comes from a broken plugin that was left out: plugin 'fast' (ckptstore-fast 0.1): ImportError: no numba. To use 'fast', fix or reinstall it; to stop loading it, set CKPTSTORE_DISABLE_PLUGINS=fast. Installed: npz.
        >>> isinstance(err, UnknownPluginError), isinstance(err, KeyError)
        (True, True)
    """  # noqa: E501

    def __init__(
        self,
        kind: str,
        name: str,
        installed: Iterable[str],
        broken: Iterable[tuple[str, str, str]],
        *,
        declared: bool,
        hint: str | None = None,
    ) -> None:
        super().__init__(kind, name, installed, hint)
        self.broken = tuple(broken)
        self.declared = declared
        self.hint = hint
        one = len(self.broken) == 1
        source = "a broken plugin that was" if one else "broken plugins that were"
        it = "it" if one else "them"
        which = "; ".join(
            f"plugin {plugin!r} ({distribution}): {error}"
            for plugin, distribution, error in self.broken
        )
        block = "CKPTSTORE_DISABLE_PLUGINS=" + ",".join(plugin for plugin, _, _ in self.broken)
        listing = ", ".join(self.installed) or "none"
        if declared:
            message = (
                f"{kind} {name!r} comes from {source} left out: {which}. To use {name!r}, "
                f"fix or reinstall {it}; to stop loading {it}, set {block}. "
                f"Installed: {listing}."
            )
        else:
            fix = hint or "install a plugin that provides it (see `ckptstore plugins`)"
            message = (
                f"unknown {kind} {name!r}; installed: {listing}. It may come from {source} "
                f"left out: {which}. Fix or reinstall {it}, or set {block} to stop loading "
                f"{it}; otherwise, to use {name!r}, {fix}."
            )
        self.args = (message,)

    def __reduce__(self) -> tuple[Any, ...]:
        arguments = (self.kind, self.name, self.installed, self.broken)
        return (_rebuild_broken_plugin, (arguments, self.declared, self.hint))


def _rebuild_broken_plugin(
    arguments: tuple[str, str, tuple[str, ...], tuple[tuple[str, str, str], ...]],
    declared: bool,
    hint: str | None,
) -> BrokenPluginError:
    return BrokenPluginError(*arguments, declared=declared, hint=hint)


class DuplicatePluginError(PluginError, ValueError):
    """Two plugins claim the same name for one extension point.

    Example::

        >>> err = DuplicatePluginError("db type", "zarr", ["ckptstore", "my-plugin"])
        >>> err.providers, isinstance(err, ValueError)
        (('ckptstore', 'my-plugin'), True)
    """

    def __init__(self, kind: str, name: str, providers: Iterable[str]) -> None:
        self.kind = kind
        self.name = name
        self.providers = tuple(providers)
        super().__init__(
            f"{kind} {name!r} is provided by more than one plugin ({', '.join(self.providers)}); "
            "uninstall one of them or block it with CKPTSTORE_DISABLE_PLUGINS."
        )


class InvalidPluginError(PluginError, TypeError):
    """A plugin returned something that does not honour its extension point's contract.

    Example::

        >>> from ckptstore import CheckpointManager
        >>> CheckpointManager("ckpt", "trainer_0", db_type=42)
        Traceback (most recent call last):
        ckptstore.errors.InvalidPluginError: expected a db type name or a DBType instance, got int
    """


class InvalidNameError(CkptStoreError, ValueError):
    """A node, blob or storage key name could escape the checkpoint prefix or is malformed.

    Example::

        >>> from ckptstore.records import validate_blob_name
        >>> validate_blob_name("../etc/passwd")
        Traceback (most recent call last):
        ckptstore.errors.InvalidNameError: ...
    """

    def __init__(self, what: str, name: object, reason: str) -> None:
        self.what = what
        self.name = name
        super().__init__(f"invalid {what} {name!r}: {reason}.")


class InvalidEpochError(CkptStoreError, ValueError):
    """An epoch argument is not an epoch: epochs are non-negative integers below 2**63
    (``int`` or a numpy integer); bools, floats, strings and negative numbers are refused
    where they enter, before anything is written or read. Always a ``ValueError``, also
    for a value of the wrong type.

    Example::

        >>> from ckptstore.records import validate_epoch
        >>> validate_epoch(np.int64(3)), validate_epoch(7, "resume_from_epoch")
        (3, 7)
        >>> validate_epoch("3", "resume_from_epoch")
        Traceback (most recent call last):
        ckptstore.errors.InvalidEpochError: resume_from_epoch='3' is not an epoch: ...
    """

    def __init__(self, argument: str, value: object, reason: str) -> None:
        self.argument = argument
        self.value = value
        super().__init__(
            f"{argument}={value!r} is not an epoch: {reason}; pass a non-negative integer "
            f"(an int or numpy integer below 2**63), e.g. {argument}=3"
        )


class JobConfigurationError(CkptStoreError, ValueError):
    """A job, runner or manager was set up in a way that cannot work.

    Its I/O settings (:class:`~ckptstore.IOSettings`) are part of that setup.

    Example::

        >>> from ckptstore import Job, JobRunner, LocalSession
        >>> JobRunner(Job(), resume_from_epoch=3).train(LocalSession())  # no manager to resume from
        Traceback (most recent call last):
        ckptstore.errors.JobConfigurationError: ...
    """


class EnvironmentVariableError(CkptStoreError, ValueError):
    """A ``CKPTSTORE_*`` environment variable holds a value that cannot be used.

    Example::

        >>> from ckptstore import IOSettings
        >>> import os
        >>> os.environ["CKPTSTORE_IO_CONCURRENCY"] = "four"
        >>> try:
        ...     IOSettings().with_environment()
        ... except EnvironmentVariableError as err:
        ...     print(err.variable, repr(err.value))
        ... finally:
        ...     del os.environ["CKPTSTORE_IO_CONCURRENCY"]
        CKPTSTORE_IO_CONCURRENCY 'four'
    """

    def __init__(self, variable: str, value: str, expected: str) -> None:
        self.variable = variable
        self.value = value
        super().__init__(
            f"environment variable {variable}={value!r} is not valid: expected {expected}; "
            f"set it to such a value or unset it (unset {variable})"
        )


class StorageOptionError(CkptStoreError, TypeError):
    """A storage option (``storage_options=`` or the CLI's ``-o KEY=VALUE``) is not one
    the URL's path type takes, or its value is wrong.

    Example::

        >>> err = StorageOptionError(  # what ``ckptstore ... -o durabilty=fsync`` reports
        ...     "ckpt", "local", "-o durabilty='fsync' refused", "did you mean -o durability=...?"
        ... )
        >>> err.path_type, isinstance(err, TypeError)
        ('local', True)
    """

    def __init__(self, url: str, path_type: str, detail: str, fix: str) -> None:
        self.url = url
        self.path_type = path_type
        super().__init__(f"storage option for {url} (path type {path_type!r}): {detail}; {fix}")


class FrozenGroupError(CkptStoreError, RuntimeError):
    """A task was added to a group that has already been compiled or run.

    Example::

        >>> from ckptstore import LocalSession, Task, TaskGroup
        >>> group = TaskGroup()
        >>> with group:
        ...     _ = Task(lambda ws: None)
        >>> _ = LocalSession().run(group)
        >>> with group:
        ...     _ = Task(lambda ws: None)
        Traceback (most recent call last):
        ckptstore.errors.FrozenGroupError: ...
    """


class NotRunError(CkptStoreError, RuntimeError):
    """A task output was fetched before any session ran the task.

    Example::

        >>> from ckptstore import Task
        >>> Task(lambda ws: None, outputs=["x"]).outputs()[0].fetch()
        Traceback (most recent call last):
        ckptstore.errors.NotRunError: ...
    """
