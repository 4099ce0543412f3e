"""The interception: the engines that see every operation (``dispatch``: a dispatch mode named by
a function mode; ``patch``: torch's public callables wrapped), the ``Observer`` they hand each
operation to, and the ``Recorder`` that applies the rule (``origins``, ``tracking``) and feeds
the cost ledger (``ledger``)."""
