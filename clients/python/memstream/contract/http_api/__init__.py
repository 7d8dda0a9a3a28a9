"""The HTTP API's wire contract: request and response models (:mod:`.api`, :mod:`.history`,
:mod:`.intake`, :mod:`.metrics`) and the route paths (:mod:`.paths`)."""
