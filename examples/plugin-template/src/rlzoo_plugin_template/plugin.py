"""The ``rlzoo`` entry point of rlzoo-plugin-template: the hooks that return its components."""

import rlzoo

from rlzoo_plugin_template.clipper import CappedISClipper


@rlzoo.hookimpl
def rlzoo_clippers():
    return [CappedISClipper]
