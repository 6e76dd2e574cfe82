"""Clean-up tables for mendeleev's free-text element fields.

mendeleev's ``discoverers`` field is free text with typos ("Sir William Ramsey", "Marguerite Derey",
"C.F. Aver von Welsbach"), initials that hide that two entries are one person ("Sir H. Davy" / "Sir Humphrey Davy",
"G.T.Seaborg") and joint names ("Pierre and Marie Curie"). Without these fixes one scientist would be split over
several KG nodes and "which elements did X discover?" would have a wrong gold answer set.
"""

from __future__ import annotations

#: Raw discoverer piece -> canonical name(s). Pieces not listed are kept as written.
DISCOVERER_ALIASES: dict[str, tuple[str, ...]] = {
    "Sir William Ramsey": ("William Ramsay",), "Sir William Ramsay": ("William Ramsay",),
    "Nils Langet": ("Nils Langlet",), "P.T.Cleve": ("Per Teodor Cleve",), "Per Theodor Cleve": ("Per Teodor Cleve",),
    "Fredrich Wöhler": ("Friedrich Wöhler",), "A.A.Bussy": ("Antoine Bussy",),
    "Sir H. Davy": ("Humphry Davy",), "Sir Humphrey Davy": ("Humphry Davy",),
    "J.L. Gay-Lussac": ("Joseph Louis Gay-Lussac",), "L.J. Thénard": ("Louis Jacques Thénard",),
    "Joseph Priestly": ("Joseph Priestley",), "M.W. Travers": ("Morris Travers",), "M. W. Travers": ("Morris Travers",),
    "Jöns Berzelius": ("Jöns Jacob Berzelius",), "J. Berzelius": ("Jöns Jacob Berzelius",),
    "Baron Rayleigh": ("Lord Rayleigh",), "L.N.Vauquelin": ("Louis Nicolas Vauquelin",),
    "Louis Vauquelin": ("Louis Nicolas Vauquelin",), "George Brandt": ("Georg Brandt",),
    "Antoine J. Balard": ("Antoine Jérôme Balard",), "R. Bunsen": ("Robert Bunsen",),
    "G. Kirchoff": ("Gustav Kirchhoff",), "Gustov Kirchoff": ("Gustav Kirchhoff",), "A. Crawford": ("Adair Crawford",),
    "Johann Gadolin": ("Johan Gadolin",), "Martin Klaproth": ("Martin Heinrich Klaproth",),
    "M. Klaproth": ("Martin Heinrich Klaproth",), "Émillo Segrè": ("Emilio Segrè",), "E.Segré": ("Emilio Segrè",),
    "Fredrich Stromeyer": ("Friedrich Stromeyer",), "T. Richter": ("Theodor Richter",),
    "W. von Hisinger": ("Wilhelm Hisinger",), "C.F. Aver von Welsbach": ("Carl Auer von Welsbach",),
    "J.A. Marinsky": ("Jacob A. Marinsky",), "L.E. Glendenin": ("Lawrence E. Glendenin",),
    "C.D. Coryell": ("Charles D. Coryell",), "J.L. Soret": ("Jacques-Louis Soret",),
    "Jean de Marignac": ("Jean Charles Galissard de Marignac",),
    "Fausto and Juan José de Elhuyar": ("Fausto Elhuyar", "Juan José Elhuyar"),
    "Smithson Tenant": ("Smithson Tennant",), "S.Tenant": ("Smithson Tennant",),
    "A.F.Fourcory": ("Antoine François Fourcroy",), "H.V.Collet-Descoltils": ("Hippolyte-Victor Collet-Descotils",),
    "Sir William Crookes": ("William Crookes",), "Pierre and Marie Curie": ("Pierre Curie", "Marie Curie"),
    "D.R.Corson": ("Dale R. Corson",), "K.R.MacKenzie": ("Kenneth Ross MacKenzie",),
    "Fredrich Ernst Dorn": ("Friedrich Ernst Dorn",), "Marguerite Derey": ("Marguerite Perey",),
    "Fredrich Soddy": ("Frederick Soddy",), "E.M. McMillan": ("Edwin McMillan",), "E.M.McMillan": ("Edwin McMillan",),
    "P.H. Abelson": ("Philip H. Abelson",), "G.T.Seaborg": ("Glenn T. Seaborg",),
    "J.W.Kennedy": ("Joseph W. Kennedy",), "A.C.Wohl": ("Arthur Wahl",), "R.A.James": ("Ralph A. James",),
    "L.O.Morgan": ("Leon O. Morgan",), "A.Ghiorso": ("Albert Ghiorso",), "A. Ghiorso": ("Albert Ghiorso",),
    "S.G.Tompson": ("Stanley G. Thompson",), "K.Street Jr.": ("Kenneth Street Jr.",),
    "Argonne": ("Argonne National Laboratory",), "Los Alamos": ("Los Alamos National Laboratory",),
    "U of Calif": ("University of California",), "U. of Cal at Berkeley": ("University of California",),
    "Soviet Nuclear Research": ("Joint Institute for Nuclear Research",),
    "T.Sikkeland": ("Torbjørn Sikkeland",), "A.E.Larsh": ("Almon E. Larsh",), "R.M.Latimer": ("Robert M. Latimer",),
    "Heavy Ion Research Laboratory (HIRL)": ("GSI Helmholtz Centre for Heavy Ion Research",),
    "et al": (),
}  # fmt: skip

#: Discovery places that are not current country names -> the country they lie in today (``None``: dropped).
LOCATION_ALIASES: dict[str, str | None] = {
    "England": "United Kingdom", "Scotland": "United Kingdom", "Great Britain": "United Kingdom", "USSR": None,
}  # fmt: skip

#: mendeleev's lattice codes -> crystal structure names.
LATTICE_NAMES: dict[str, str] = {
    "BCC": "Body-centered cubic", "FCC": "Face-centered cubic", "HEX": "Hexagonal", "CUB": "Cubic",
    "SC": "Simple cubic", "DIA": "Diamond cubic", "TET": "Tetragonal", "ORC": "Orthorhombic",
    "RHL": "Rhombohedral", "MCL": "Monoclinic",
}  # fmt: skip

#: Goldschmidt classes, with mendeleev's spelling "litophile" corrected.
GOLDSCHMIDT_NAMES: dict[str, str] = {
    "atmophile": "Atmophile", "litophile": "Lithophile", "lithophile": "Lithophile", "chalcophile": "Chalcophile",
    "siderophile": "Siderophile", "synthetic": "Synthetic",
}  # fmt: skip
