"""Data planes: what moves a work item's tensors between ranks. All implement
:class:`~hvdlite.core.planes.base.DataPlane`; the executor runs each item on the first one enabled for it."""
