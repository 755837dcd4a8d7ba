"""The ``deleatur`` command: a thin shell over :class:`deleatur.Memory`."""
