"""The store's transition policy: every module with an after-effect of a job's
status change (``store.effects``), imported so that each has registered its
rule. Their order is each rule's own ``order``:

=====  ==============  =====================================================
order  rule            what it does
=====  ==============  =====================================================
10     tallies         the (status, group) counts the metrics read
20     outbox          one webhook delivery per hook that wants the status
30     arrays          an array member's end lets the next held member start
40     dependencies    an end counts for its children, or cancels them
=====  ==============  =====================================================
"""

from __future__ import annotations

from raylane.orchestrator.store import arrays, dependencies, effects, tallies, webhooks

RULE_MODULES = (tallies, webhooks, arrays, dependencies)
effects.installed = True
