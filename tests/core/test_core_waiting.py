"""The tickets waiting for each image (:class:`~kuikproxy.core.tickets.Waiting`): one ticket is
kept as it is, a second makes a dict, and what it answers never depends on which."""

from kuikproxy.core.images import Image
from kuikproxy.core.tickets import Operation, Ticket, Waiting


def ticket(resource: str, reference: str = "v1") -> Ticket:
    return Ticket(resource, Image("reg.test", "app", reference), Operation.CHECK, None, 0.0)


def test_one_ticket_is_kept_as_it_is_and_released() -> None:
    waiting, a = Waiting(), ticket("a")
    assert not waiting and waiting.of(a.image.key) == ()
    waiting.add(a)
    assert waiting and a in waiting and waiting.of(a.image.key) == (a,) and waiting.count() == 1
    assert waiting.release(a)
    assert not waiting and a not in waiting
    assert not waiting.release(a)


def test_tickets_of_one_image_keep_their_order_through_releases() -> None:
    waiting = Waiting()
    a, b, c, other = ticket("a"), ticket("b"), ticket("c"), ticket("a", "v2")
    for t in (a, b, c, other):
        waiting.add(t)
    assert waiting.of(a.image.key) == (a, b, c) and waiting.count() == 4
    assert waiting.release(b) and b not in waiting and not waiting.release(b)
    assert waiting.of(a.image.key) == (a, c)
    assert waiting.release(a) and waiting.of(a.image.key) == (c,) and c in waiting
    waiting.add(a)  # back to two after being one
    assert waiting.of(a.image.key) == (c, a)
    assert waiting.pop(a.image.key) == (c, a) and waiting.of(a.image.key) == ()
    assert waiting.count() == 1 and waiting.pop(a.image.key) == ()
    assert waiting.release(other) and not waiting


def test_a_ticket_of_another_image_is_not_waiting() -> None:
    waiting, a = Waiting(), ticket("a")
    waiting.add(a)
    stranger = ticket("a")  # same image and resource, another ticket
    assert stranger not in waiting and not waiting.release(stranger)
    assert waiting.of(a.image.key) == (a,)
