"""Errors a user can cause; each names the fragment, argument or node at fault."""


class FragcError(Exception):
    """Base class for fragc's user-facing errors."""


class FragmentError(FragcError):
    """A fragment was declared or called inconsistently."""


class VerifyError(FragcError):
    """A module broke an invariant; the message names the node (and pass)."""
