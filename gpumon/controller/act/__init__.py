"""Actuators: one function per kind of write the controller makes to the API server.

Each takes a plan (or one piece of one) from :mod:`gpumon.controller.core` and applies it
through :class:`~gpumon.kube.client.KubeApi`, compares before it writes, and decides here,
in one place (:mod:`gpumon.controller.act.retry`), what a conflict or a refusal means and when
to try again. Nothing in here decides *what* to write.
"""
