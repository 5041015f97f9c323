"""Damaged data, named by file: problems and the error that names them, ``check-data``, and bad files met in training.

Modules: ``problems`` (:class:`~kpca.training.data_checks.problems.DataProblem`,
:class:`~kpca.training.data_checks.problems.DataError`), ``check_data`` (the parallel check over every file behind the
``check-data`` subcommand), ``bad_files`` (a damaged file met while training: named in the error, or skipped and
counted). Each app's own checks live in its ``data_checks`` module.
"""
