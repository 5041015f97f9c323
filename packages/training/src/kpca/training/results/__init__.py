"""Results: what an evaluation writes and how runs are compared, apart from the training runtime.

Modules: ``tables`` (Markdown + CSV result tables, written atomically), ``protocol`` (each column group's evaluation
protocol: the rules an app declares, ``published`` or ours with the differences, ``protocol.json``), ``schema``
(``ReportSchema``: an app's report, registered under the ``kpca.reports`` entry points), ``references`` (published
numbers from a CSV), ``collect`` (the runs and evaluations under a folder, grouped into models), ``render`` (the
comparison's Markdown, CSV rows and figure) and ``compare`` (the ``kpca-report`` command). Of the runtime they use
only ``kpca.training.files`` and ``kpca.training.run_config``; the runtime and the apps import ``tables``,
``protocol`` and ``schema`` to write their reports.
"""
