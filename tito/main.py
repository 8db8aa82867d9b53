"""`tito`: the TinyTorch course CLI.

    tito module list|status|start|complete|reset    the student loop
    tito export NN / tito test NN / tito checkpoint NN
    tito student init DIR                           write a student edition
    tito nbgrader generate|collect|autograde|feedback|export   the instructor loop
    tito milestone list|run                         historic milestones
    tito serve MODEL --port N / tito serve bench    serve a checkpoint over HTTP, measure it under load
    tito guide build                                the lab guide (HTML book)
    tito doctor                                     is this machine ready?
    tito compete run DIR                            the kernel competition (module 17)
    tito leaderboard FILES_OR_FOLDERS               merge module-19 result files into a class leaderboard
"""
from __future__ import annotations

import typer

from tito import guide
from tito.commands import check, compete, doctor, milestone, module, nbgrader, serve, student
from tito.commands import leaderboard

app = typer.Typer(help="TinyTorch course CLI: build, test and grade the modules.", no_args_is_help=True,
                  pretty_exceptions_enable=False, add_completion=False)
app.add_typer(module.app, name="module")
check.register(app)
app.add_typer(student.app, name="student")
app.add_typer(nbgrader.app, name="nbgrader")
app.add_typer(milestone.app, name="milestone")
app.add_typer(guide.app, name="guide")
app.add_typer(serve.app, name="serve")
doctor.register(app)
app.add_typer(compete.app, name="compete")
leaderboard.register(app)


if __name__ == "__main__":
    app()
