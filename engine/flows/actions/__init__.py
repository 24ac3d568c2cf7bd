"""What a `do` node does: an action on the clinic's records (confirm, cancel, move or book the
appointment), the agenda's free times offered to the patient (`offer_slots`), or staff brought
in (notify, hand-off). node.py decides the step; appointment.py holds the effects, run in the
step's own transaction; offer.py the numbered list of free times and the patient's pick."""
