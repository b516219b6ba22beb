"""What a person looks at: the Rich forms of the check report (``check``), of
``suggest``, of ``show`` (``tree``) and of region changes (``changes``), the HTML file
(``html``) and the Graphviz diagrams (``dot``, laid out by ``fold``, chosen by
``view``). Formats that another program reads are ``capturelint.formats``
(docs/house.md)."""
