"""The kernel model's names, as plans show them (its fits are kept under the first), and what each means for the
plan's reasons: apart from the model, so that a plan whose predictions are remembered (:mod:`modak.predict.memo`)
does not import it."""

PREDICTOR = "kernels"  # its name in plans, and its fits' (modak.predict.fits)
TRANSFER_PREDICTOR = "kernels-transfer"  # on a machine without kernel rows, by its ceilings
NOTES = {PREDICTOR: f"{PREDICTOR}: the sum over the kernels the runtime plans for the step, each of a kind profiled "
                    "on this machine",
         TRANSFER_PREDICTOR: f"{TRANSFER_PREDICTOR}: the same from the nearest profiled machine's kernel rows, by "
                             "the ceilings, with a wider interval"}
