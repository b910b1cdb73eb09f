<?php
/**
 * A sharded counter on php-gds's documented API, written for gds_counter's
 * tests. It follows the behaviour the PHP article describes (it is not the
 * article's code; PHP_ARTICLE_SRC runs that instead):
 *
 * - shards are entities of kind IK_CounterShardEntity, named
 *   "<type>_<id>_<n>" for a shard number n drawn at random from 1..20;
 * - a shard has `target` ("<type>_<id>", a string, indexed) and `count`
 *   (an integer, unindexed);
 * - the total is the sum of `count` over a GQL query for the target;
 * - an increment reads the total, fetches the shard by name (a new one at 0
 *   when missing), adds one and upserts it, with NO transaction: two
 *   increments racing on one shard can both write the same value, and one
 *   of them is lost. That defect is kept on purpose.
 */

namespace GdsCounterHarness;

class ArticleStyleCounter
{
    const KIND = 'IK_CounterShardEntity';
    const SHARDS = 20;

    /** @var \GDS\Store */
    private $store;

    /** @var string */
    private $target;

    public function __construct($type, $id, \GDS\Gateway $gateway)
    {
        $schema = (new \GDS\Schema(self::KIND))
            ->addString('target', true)
            ->addInteger('count', false);
        $this->store = new \GDS\Store($schema, $gateway);
        $this->target = $type . '_' . $id;
    }

    public function getCount()
    {
        $this->store->query(
            'SELECT * FROM ' . self::KIND . ' WHERE target = @target',
            ['target' => $this->target]
        );
        $total = 0;
        foreach ($this->store->fetchAll() ?: [] as $shard) {
            $total += (int)$shard->count;
        }
        return $total;
    }

    public function increment()
    {
        $number = mt_rand(1, self::SHARDS);
        $before = $this->getCount();
        $name = $this->target . '_' . $number;
        $shard = $this->store->fetchByName($name);
        if ($shard === null) {
            $shard = $this->store->createEntity(['target' => $this->target, 'count' => 0]);
            $shard->setKeyName($name);
        }
        $shard->count = (int)$shard->count + 1;
        $this->store->upsert($shard);
        return $before + 1;
    }
}
