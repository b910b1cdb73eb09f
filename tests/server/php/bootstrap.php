<?php
/**
 * Test-harness bootstrap for php-gds without Composer.
 *
 * - php-gds's classes come from PHP_GDS_SRC (php-gds's `src` folder), loaded
 *   PSR-4 style: GDS\Foo\Bar -> $PHP_GDS_SRC/GDS/Foo/Bar.php.
 * - Guzzle 7 and the PSR interfaces come from Debian's php-guzzlehttp-guzzle
 *   package, whose autoloader is on PHP's include path (/usr/share/php).
 * - google/auth is not needed: php-gds's REST gateway only builds the
 *   google/auth middleware when DATASTORE_EMULATOR_HOST is NOT set.
 */

$gdsCounterGdsSrc = getenv('PHP_GDS_SRC');
if ($gdsCounterGdsSrc === false || $gdsCounterGdsSrc === '' || !is_dir($gdsCounterGdsSrc . '/GDS')) {
    fwrite(STDERR, "PHP_GDS_SRC must name php-gds's src folder (the one holding GDS/), got "
        . var_export($gdsCounterGdsSrc, true) . "\n");
    exit(2);
}
if (!stream_resolve_include_path('GuzzleHttp/autoload.php')) {
    fwrite(STDERR, "Guzzle is missing: apt-get install php-guzzlehttp-guzzle\n");
    exit(2);
}
require_once 'GuzzleHttp/autoload.php';

spl_autoload_register(function (string $class) use ($gdsCounterGdsSrc): void {
    if (strncmp($class, 'GDS\\', 4) !== 0) {
        return;
    }
    $file = $gdsCounterGdsSrc . '/' . str_replace('\\', '/', $class) . '.php';
    if (is_file($file)) {
        require $file;
    }
});

/**
 * Point php-gds at a server given as HOST:PORT, the way its users do:
 * DATASTORE_EMULATOR_HOST for the address, DATASTORE_PROJECT_ID for the
 * project (read by GDS\Gateway::determineProjectId when no gateway is given).
 */
function gds_counter_point_at(string $hostPort, string $project): void
{
    putenv('DATASTORE_EMULATOR_HOST=' . $hostPort);
    putenv('DATASTORE_PROJECT_ID=' . $project);
}

/**
 * The counter the scripts drive: the article's own \IK\CounterShardDS when
 * PHP_ARTICLE_SRC names a folder holding its files (it always uses the
 * default namespace, so only when $namespace is ''), else this project's
 * harness (harness_counter.php).
 */
function gds_counter_make_counter(string $project, string $namespace): object
{
    $article = getenv('PHP_ARTICLE_SRC');
    if ($article !== false && $article !== '' && $namespace === '') {
        require_once $article . '/CounterShardEntity.php';
        require_once $article . '/CounterShardDS.php';
        return new \IK\CounterShardDS('Counter Test', 1);
    }
    require_once __DIR__ . '/harness_counter.php';
    $gateway = new \GDS\Gateway\RESTv1($project, $namespace === '' ? null : $namespace);
    return new \GdsCounterHarness\ArticleStyleCounter('Counter Test', 1, $gateway);
}

/** Which code gds_counter_make_counter() returns, for the scripts to report. */
function gds_counter_counter_code(object $counter): string
{
    return $counter instanceof \GdsCounterHarness\ArticleStyleCounter ? 'harness' : 'article';
}
