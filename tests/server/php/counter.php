<?php
/**
 * php counter.php HOST:PORT PROJECT NAMESPACE count
 * php counter.php HOST:PORT PROJECT NAMESPACE increment TIMES
 *
 * The tests' PHP side: reads ("Counter Test", 1)'s total with getCount(),
 * or increments it TIMES times, and prints one JSON line: {"count": N} or
 * {"increments": TIMES, "returned": [...]} (what each increment returned),
 * both with "code": "article" or "harness".
 */

require __DIR__ . '/bootstrap.php';

if ($argc < 5 || !in_array($argv[4], ['count', 'increment'], true)
    || ($argv[4] === 'increment' && ($argc !== 6 || !ctype_digit($argv[5])))) {
    fwrite(STDERR, "usage: php counter.php HOST:PORT PROJECT NAMESPACE count|increment TIMES\n");
    exit(2);
}
[, $hostPort, $project, $namespace, $command] = $argv;
gds_counter_point_at($hostPort, $project);
$counter = gds_counter_make_counter($project, $namespace);
$code = gds_counter_counter_code($counter);

if ($command === 'count') {
    echo json_encode(['count' => $counter->getCount(), 'code' => $code]), "\n";
    exit(0);
}
$returned = [];
for ($i = 0; $i < (int)$argv[5]; $i++) {
    $returned[] = $counter->increment();
}
echo json_encode(['increments' => count($returned), 'returned' => $returned, 'code' => $code]), "\n";
