<?php
/**
 * php increment_loop.php HOST:PORT PROJECT NAMESPACE SECONDS
 *
 * With PHP_GDS_SRC naming php-gds's src folder: the PHP article's increment
 * on counter ("Counter Test", 1), over and over for SECONDS seconds, against
 * the Datastore server at HOST:PORT (e.g. `gds-counter serve`). Prints one
 * JSON line on stdout: {"increments": N, "seconds": S}, N the increments
 * that returned, S the seconds they took. Which code ran (the article's
 * class when PHP_ARTICLE_SRC is set and NAMESPACE is '', else the harness)
 * is said on stderr.
 */

require __DIR__ . '/bootstrap.php';

if ($argc !== 5 || !is_numeric($argv[4]) || (float)$argv[4] < 0) {
    fwrite(STDERR, "usage: php increment_loop.php HOST:PORT PROJECT NAMESPACE SECONDS\n");
    exit(2);
}
[, $hostPort, $project, $namespace, $seconds] = $argv;
gds_counter_point_at($hostPort, $project);
$counter = gds_counter_make_counter($project, $namespace);
fwrite(STDERR, 'increment_loop.php: counting with the ' . gds_counter_counter_code($counter) . " code\n");

$start = microtime(true);
$deadline = $start + (float)$seconds;
$increments = 0;
while (microtime(true) < $deadline) {
    $counter->increment();
    $increments++;
}
echo json_encode(['increments' => $increments, 'seconds' => round(microtime(true) - $start, 3)]), "\n";
