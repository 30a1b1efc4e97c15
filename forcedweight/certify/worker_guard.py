"""Imported first by certify's fork server: the fork server dies with the process that started it.

``run._mp_context`` preloads this module in the fork server (``set_forkserver_preload``), so that a
caller killed by SIGKILL or SIGTERM does not leave the fork server, and through it the workers
(each ties itself to the fork server in ``run._init_worker``), alive under PID 1. Importing it
anywhere else ties the importing process to its parent the same way.
"""

from forcedweight.io import die_with_parent

ARMED = die_with_parent()
