"""The PHP article's ``counter_test.php``, in Python.

What the PHP script does, step by step: build the counter for target type
"Counter Test" and id 1, log its current value with ``error_log``, then
increment it and log the value ``increment()`` returned. Run it with no
arguments; it counts in the embedded SQLite default
(./gds_counter.sqlite3), or wherever GDS_URL points:

    $ python examples/counter_test.py
    Current counter value: 0
    Next counter value: 1

PHP's command-line interpreter, with no log file configured, writes an
``error_log()`` message as the bare text and a newline on stderr, so this
script writes the same two lines to sys.stderr with ``print`` and nothing to
stdout. Plain
writes, not ``logging``: a script's output is its interface, and a logging
setup would be process-wide state for two fixed lines.
"""

import sys

from gds_counter.counter import CounterShardDS

counter = CounterShardDS("Counter Test", 1)
print("Current counter value: " + str(counter.get_count()), file=sys.stderr)
print("Next counter value: " + str(counter.increment()), file=sys.stderr)
