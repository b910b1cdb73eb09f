"""The PHP article's counter_test.php, line for line, in Python.

    <?php
    require_once 'vendor/autoload.php';
    $counter = new CounterShardDS("Counter Test", 1);
    $count = $counter->increment();
    echo "Count: " . $count;

Run it with no arguments: it counts in the embedded SQLite default
(./gds_counter.sqlite3), or wherever GDS_URL points.
"""

from gds_counter.counter import CounterShardDS

counter = CounterShardDS("Counter Test", 1)
count = counter.increment()
print("Count: " + str(count))
